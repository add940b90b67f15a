"""The DataVolume controllers, split by source kind as CDI's are (pkg/controller/datavolume/ and the claim
controllers in pkg/controller/):

- `base`: the DataVolume reconciler shared by import, upload and externally populated DataVolumes (CDI's
  controller-base.go with import-controller.go and upload-controller.go of pkg/controller/datavolume/):
  renders and creates the claim, derives phase, conditions, progress and events from it;
  `staticvolumes` and `progress` are its helpers.
- `imports` (with `importpod`, `importproxy`): the claim's importer pod (CDI's pkg/controller/import-controller.go).
- `uploads` (with `uploadpki`): the claim's upload server pod and Service (CDI's upload-controller.go).
- `clones`: PVC and snapshot clone DataVolumes (CDI's pvc-clone-controller.go and
  snapshot-clone-controller.go): the target claim, tokens, status and events; the clone itself (strategy and
  phases) is `cdi.controller.clone`'s."""
