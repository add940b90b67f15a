"""The DataVolume controllers, split by source kind as CDI's are (pkg/controller/datavolume/ and the claim
controllers in pkg/controller/):

- `base`: the DataVolume reconciler shared by import, upload and externally populated DataVolumes (CDI's
  controller-base.go with import-controller.go and upload-controller.go of pkg/controller/datavolume/):
  renders and creates the claim, derives phase, conditions, progress and events from it;
  `staticvolumes` is its helper.
- `imports` (with `importpod`, `importproxy`): the claim's importer pod (CDI's pkg/controller/import-controller.go).
- `uploads` (with `uploadpki`): the claim's upload server pod and Service (CDI's upload-controller.go).
- `clones`: PVC and snapshot clones (CDI's pvc-clone-controller.go, snapshot-clone-controller.go and
  clone-controller.go); their strategy choice is `cdi.controller.clone.planner`."""
