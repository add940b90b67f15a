"""cdi-apiserver: CDI's admission webhooks (validate and default CDI kinds with CDI's rules and
messages) and, as an aggregated API, upload tokens (`upload.cdi.kubevirt.io`)."""
