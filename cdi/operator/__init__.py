"""cdi-operator: reconciles the cluster-scoped `CDI` resource into CDI's components (as CDI's operator),
and renders what installs the operator itself (`cdi manifests`). Imports `api`, `kube` and `common`."""
