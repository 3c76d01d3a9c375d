"""One training run: its config, the loop, its evaluation record, its checkpointed state, the
session it reports to, and local (gloo) launch. No Ray here."""
