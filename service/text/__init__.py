"""Text in front of the model and after it: tokenizer, sentence splitting, protected spans
(placeholders, what the model cannot spell), the per-request pipeline, HTML and files."""
