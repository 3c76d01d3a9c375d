"""The recipe in the trainers people use; each module is an optional extra that only its
users import (`hf`: `pip install "schedule-search[hf]"`)."""
