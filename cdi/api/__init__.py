"""The CDI API as data: names, CRD manifests, typed views over object dicts, pure defaulting and
validation. Imports nothing else of ours so every other package can lean on it."""
