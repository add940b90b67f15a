"""Environment variable names of the components' own pods (cdi-operator, cdi-deployment, cdi-apiserver,
cdi-uploadproxy), as CDI's operator writes them into its Deployments and its components read them: a
Deployment made by CDI's operator and one made by ours configure a component alike.

As with the worker pods' names (`cdi.api.env`), each is a constant here and nowhere else
(`tests/test_code_quality.py` forbids the literals in the rest of `cdi/`): one side writing a name the other
does not read is a setting that silently stops working."""

from typing import Final

# every component's: its namespace (downward API `metadata.namespace`), CDI's namespace
POD_NAMESPACE: Final = "POD_NAMESPACE"
# the controller's: the worker pods' imagePullPolicy (the operator passes the CDI resource's)
PULL_POLICY: Final = "PULL_POLICY"
# the operator's: its version (CDI's release manifests set the image tag) and each component's image
OPERATOR_VERSION: Final = "OPERATOR_VERSION"
CONTROLLER_IMAGE: Final = "CONTROLLER_IMAGE"
IMPORTER_IMAGE: Final = "IMPORTER_IMAGE"
CLONER_IMAGE: Final = "CLONER_IMAGE"
APISERVER_IMAGE: Final = "APISERVER_IMAGE"
UPLOAD_SERVER_IMAGE: Final = "UPLOAD_SERVER_IMAGE"
UPLOAD_PROXY_IMAGE: Final = "UPLOAD_PROXY_IMAGE"
# component image name -> the variable the operator is given its image in
IMAGES: Final = {"cdi-controller": CONTROLLER_IMAGE, "cdi-importer": IMPORTER_IMAGE, "cdi-cloner": CLONER_IMAGE,
                 "cdi-apiserver": APISERVER_IMAGE, "cdi-uploadserver": UPLOAD_SERVER_IMAGE,
                 "cdi-uploadproxy": UPLOAD_PROXY_IMAGE}
# the operator's (CDI's): the runbook URL of its alerts (one `%s`, the alert's name) and the namespace of the
# Prometheus it lets read CDI's namespace
RUNBOOK_URL_TEMPLATE: Final = "RUNBOOK_URL_TEMPLATE"
MONITORING_NAMESPACE: Final = "MONITORING_NAMESPACE"
# the upload proxy's: cdi-apiserver's public key (PEM), which upload tokens are verified with
APISERVER_PUBLIC_KEY: Final = "APISERVER_PUBLIC_KEY"
