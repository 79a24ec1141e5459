"""The plan directory: plan.yaml's schema and the one reader, the one (atomic) writer, the diff of two plans."""
