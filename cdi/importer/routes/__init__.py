"""The import routes, one module each (the table in `cdi.importer.pipeline` says which runs when).

`context` holds what they share (`ImportContext`: the writer, the progress plan, checkpointing, the
fetch of spans, the target checks) and the route names the result reports."""
