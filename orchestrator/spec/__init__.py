"""The inputs: model and training specs, cluster profiles, YAML reading with file:line errors, Hugging Face import."""
