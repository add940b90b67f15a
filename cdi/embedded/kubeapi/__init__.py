"""The embedded imitation of kube-apiserver (named `kubeapi` so it is never confused with CDI's own
`cdi.apiserver`, the cdi-apiserver component): the kinds, semantics and wire formats that CDI, kubectl and
the official client rely on, over an in-memory index persisted to SQLite.

Layers, bottom up: `errors` (Status bodies), `selectors`, `jsonpath`, `patching`, `schema`
(structural validation), `resources` (the kinds served), `store` (revisions, persistence, watch
history), `objects` (API semantics: create/update/patch/delete/watch with admission and defaults),
`garbage` (owner references, namespaces), `quotausage` and `quota` (ResourceQuota admission and
status), `tables` and `discovery` (what kubectl prints and finds),
`handlers` (REST over aiohttp), `server` (TLS, tokens, kubeconfig)."""
