"""The DataVolume controllers, split by source kind as CDI's are (pkg/controller/datavolume/ and the claim
controllers in pkg/controller/):

- `base`: what every DataVolume reconciler shares (CDI's controller-base.go): renders and creates the
  claim, derives phase, conditions and events from it, and the common watches; `staticvolumes` is its
  helper. One reconciler per source kind on it: `importsource` (http, s3, gcs, registry, blank),
  `uploadsource` (upload) and `externalpopulation` (a claim filled by its own data source or populator).
- `imports` (with `importpod`, `importproxy`): the claim's importer pod (CDI's pkg/controller/import-controller.go).
- `uploads` (with `uploadpki`): the claim's upload server pod and Service (CDI's upload-controller.go).
- `clones`: PVC and snapshot clone DataVolumes (CDI's pvc-clone-controller.go and
  snapshot-clone-controller.go): the target claim, tokens, status and events; the clone itself (strategy and
  phases) is `cdi.controller.clone`'s."""
