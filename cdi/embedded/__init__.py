"""The embedded control plane behind `cdi up`: a Kubernetes-compatible API server on SQLite, a local
node that runs pods as sandboxed processes, and local storage. Only `cdi.cli` imports it; the
controller talks to it over HTTP like to any cluster and never knows the difference."""
