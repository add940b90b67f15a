"""The local storage: a dynamic provisioner, PV binder, snapshotter and resizer whose volumes are
directories, sparse files or loop-mounted ext4 images under `cdi up`'s data directory."""
