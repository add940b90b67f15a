"""Cloning, as CDI's pkg/controller/clone: the planner chooses csi-clone, snapshot or host-assisted copy and
returns the phases that carry it out on the target claim, one module each, each with its unit test:

- `planner`: the strategy (pure) and `phases()`, the phases of the strategy a target records;
- `phase`: the `Phase` protocol (a name recorded in `cdi.kubevirt.io/clonePhase`, a `reconcile`) and `Step`;
- `csiclone`, `snapshot`, `snapclone`, `hostclone`, `prepclaim`, `rebind`: the phases;
- `target`: one clone's target, source and temporary objects; `sourceclaim`: when the source may be read;
- `execute`: one look at a clone, walking the phases (the clone DataVolume reconciler and the clone
  populator both drive clones through it);
- `size`, `sizedetection`, `token`: the target's size, the pod that measures a source image, clone tokens."""
