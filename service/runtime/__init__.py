"""The runtime: an exported model on ONNX Runtime (sessions, KV caches, search heads), the
engine that steps a batch of rows, and the step-cost model. numpy and onnxruntime only."""
