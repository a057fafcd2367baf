"""The lab's HTTP API: one module of routes per resource, and the schemas they answer with."""
