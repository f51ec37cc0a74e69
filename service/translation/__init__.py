"""Translation as a service: a translator per model around its batcher, the registry of
models, routing between language pairs (pivots included), detection and dispatch."""
