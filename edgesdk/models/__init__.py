"""Model sources (Hugging Face directories, GGUF files, aliases) and host-side loading."""
