"""The web layer: the FastAPI app, its routes per API, middleware, access control, error
mapping and metrics endpoint. The only layer besides the composition root that reads the
settings."""
