"""The SGLang side: reaching workers (API key, TLS), their KV-event wire format, the model's tokenizer."""
