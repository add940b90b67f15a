"""Cloning: the planner that chooses csi-clone, snapshot or host-assisted copy, and the phases that
carry each out on the target claim (CDI's pkg/controller/clone)."""
