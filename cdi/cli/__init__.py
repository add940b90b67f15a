"""The `cdi` command: `cdi up` (the embedded control plane with CDI on it), `cdi demo`, and the
components' entry points for a real cluster."""
