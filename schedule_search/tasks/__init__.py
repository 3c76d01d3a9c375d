"""What is trained: the task protocol (`protocol`), the built-in tasks (`linreg`, `tinylm`
on the `corpus` of token files) and the registry that builds the one a config names.

A user's task module imports what it implements from here (or from `tasks.protocol`)."""

from schedule_search.tasks.protocol import Microbatch, Task, seeded_generator, stream_generator
from schedule_search.tasks.registry import build_task

__all__ = ["Microbatch", "Task", "build_task", "seeded_generator", "stream_generator"]
