"""`cdi manifests`: what `kubectl apply -f -` needs to install cdi on a cluster, as CDI's release asset
`cdi-operator.yaml` (the namespace, CDI's CRDs, the operator's ServiceAccount, least-privilege RBAC and
Deployment); `--cr` prints `cdi-cr.yaml`, an example `CDI` resource the operator then deploys.

The operator's version is the images' tag (`--tag`, as CDI's release sets `OPERATOR_VERSION` to its image tag):
it is what the `CDI` resource's status reports and what an upgrade goes by, so two builds meant to upgrade one
into the other get two tags (`images/build` with `CDI_IMAGE_TAG=$(scripts/build-version)`), or the same images
another `--operator-version`. Versions are compared as semantic versions (a leading `v` allowed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from cdi.api import groups
from cdi.operator import versions
from cdi.operator.resources import DEFAULT_REGISTRY, Images, example_cr, operator_install


def register(commands: Any) -> None:
    defaults = Images()
    parser = commands.add_parser("manifests", help="print the install manifests (kubectl apply -f -)")
    parser.add_argument("--image-registry", default=DEFAULT_REGISTRY,
                        help=f"where the cdi-* images are (default {DEFAULT_REGISTRY})")
    parser.add_argument("--tag", default=defaults.tag, help=f"image tag (default {defaults.tag})")
    parser.add_argument("--operator-version", default=None,
                        help="the operator's version, OPERATOR_VERSION (default: the tag)")
    parser.add_argument("--namespace", default=groups.CDI_NAMESPACE, help="CDI's namespace (default cdi)")
    parser.add_argument("--image-pull-policy", default="IfNotPresent", choices=("Always", "IfNotPresent", "Never"))
    parser.add_argument("--cr", action="store_true", help="print an example CDI resource instead")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.cr:
        documents = [example_cr()]
    else:
        version = args.operator_version or args.tag
        if not versions.label_safe(version):  # the operator labels what it applies with it
            print(f"cdi manifests: operator version {version!r} is not a label value (at most 63 letters, digits,"
                  " '-', '_' or '.', a letter or digit at each end)", file=sys.stderr)
            return 2
        documents = operator_install(args.namespace, Images(args.image_registry.rstrip("/"), args.tag),
                                     args.image_pull_policy, version)
    yaml.safe_dump_all(documents, sys.stdout, sort_keys=False, default_flow_style=False)
    return 0
