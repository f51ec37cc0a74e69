"""How the embedded default model is trained: corpus, tokenizer (export-time code, may use torch)."""
