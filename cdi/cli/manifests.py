"""`cdi manifests`: what `kubectl apply -f -` needs to install cdi on a cluster, as CDI's release asset
`cdi-operator.yaml` (the namespace, CDI's CRDs, the operator's ServiceAccount, least-privilege RBAC and
Deployment); `--cr` prints `cdi-cr.yaml`, an example `CDI` resource the operator then deploys."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from cdi.api import groups
from cdi.operator.resources import DEFAULT_REGISTRY, Images, example_cr, operator_install


def register(commands: Any) -> None:
    defaults = Images()
    parser = commands.add_parser("manifests", help="print the install manifests (kubectl apply -f -)")
    parser.add_argument("--image-registry", default=DEFAULT_REGISTRY,
                        help=f"where the cdi-* images are (default {DEFAULT_REGISTRY})")
    parser.add_argument("--tag", default=defaults.tag, help=f"image tag (default {defaults.tag})")
    parser.add_argument("--namespace", default=groups.CDI_NAMESPACE, help="CDI's namespace (default cdi)")
    parser.add_argument("--image-pull-policy", default="IfNotPresent", choices=("Always", "IfNotPresent", "Never"))
    parser.add_argument("--cr", action="store_true", help="print an example CDI resource instead")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.cr:
        documents = [example_cr()]
    else:
        documents = operator_install(args.namespace, Images(args.image_registry.rstrip("/"), args.tag),
                                     args.image_pull_policy)
    yaml.safe_dump_all(documents, sys.stdout, sort_keys=False, default_flow_style=False)
    return 0
