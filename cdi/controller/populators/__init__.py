"""CDI's volume populators: a PVC whose `spec.dataSourceRef` names a `VolumeImportSource`,
`VolumeUploadSource` or `VolumeCloneSource` (cdi.kubevirt.io) is filled through a prime claim
`prime-<pvc uid>` that the usual importer, upload-server or clone pods work on; the prime's volume is
then handed to the user's claim (the PV's claimRef moves) and the prime, left Lost, is deleted.

`base` holds what every kind shares (CDI's populator-base), one module per kind the rest."""
