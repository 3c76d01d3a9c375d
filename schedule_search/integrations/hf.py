"""The recipe in Hugging Face `transformers.Trainer` (`pip install "schedule-search[hf]"`).

    from schedule_search.integrations.hf import RecipeCallback
    callback = RecipeCallback(recipe, tokens_per_step=batch * seq_len * accumulation * ranks)
    args = TrainingArguments("out", eval_strategy="steps", **callback.training_arguments())
    trainer = Trainer(model, args, train_dataset=..., eval_dataset=..., callbacks=[callback],
                      optimizers=callback.optimizers(model))

What the Trainer then does with the recipe, and where (transformers' own hooks, read in its
`Trainer._inner_training_loop`): the optimizer and `recipe.lr_scheduler` are passed in
(`optimizers=`), so the Trainer steps the recipe's LR on the token clock once per optimizer
step and logs the LR that step used. The callback keeps the recipe's EMA bank: folded in at
`on_step_end` (the Trainer has just stepped, and a schedule-free optimizer is in its train
mode, so the bank averages the training point as the sweep's own loop does). When the Trainer
is about to evaluate (`control.should_evaluate`, set by its flow callback, which runs before a
user's), the model gets the recipe's evaluation weights: schedule-free's averaged point, then
EMA `recipe.ema_fraction` in place; `on_evaluate` puts the training point back bit for bit.
The bank is saved beside each checkpoint (`recipe_ema.pt` in `checkpoint-<step>/`) and loaded
when the Trainer resumes from one.

The recipe's window maps to the Trainer's own accumulation only where it is a fixed count of
micro-batches (`gradient_accumulation_steps`, clipping at `max_grad_norm` after the Trainer
averages: clip after normalizing); `tokens`, `seconds` and `grad_norm` windows close on what
the Trainer does not measure, so they are refused.

One process or data-parallel ranks (every rank holds the same bank; rank 0 saves it). A model
sharded by FSDP inside the Trainer is not covered: its bank would be per shard.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from schedule_search.core.averaging import EmaBank
from schedule_search.core.files import atomic_write_bytes
from schedule_search.recipe import Recipe
from schedule_search.recipe.scheduler import RecipeLRScheduler

__all__ = ["EMA_FILE", "RecipeCallback"]

#: The bank's file inside each of the Trainer's checkpoint folders.
EMA_FILE = "recipe_ema.pt"


class RecipeCallback(TrainerCallback):
    """The recipe's LR schedule, EMA bank and evaluation weights for `transformers.Trainer`.

    `tokens_per_step`: the tokens in one optimizer step (per-device batch x sequence length x
    gradient accumulation x ranks); the schedule and the EMAs run on the clock it gives.
    """

    def __init__(self, recipe: Recipe, tokens_per_step: float) -> None:
        window = recipe.spec.window
        if window.policy != "microbatches":
            raise ValueError(
                f"window.policy: the Trainer accumulates a fixed count of micro-batches; a "
                f"'{window.policy}' window cannot be mapped (export a recipe with "
                "policy: microbatches)"
            )
        if not (isinstance(tokens_per_step, int | float) and tokens_per_step > 0):
            raise ValueError(
                "tokens_per_step: expected the tokens in one optimizer step (batch size x "
                f"sequence length x gradient accumulation x ranks), got {tokens_per_step!r}"
            )
        self.recipe = recipe
        self.tokens_per_step = float(tokens_per_step)
        self.ema: EmaBank | None = None  # built at train begin, on the model's device
        self._evaluation: contextlib.ExitStack | None = None  # open while evaluation weights are in

    def training_arguments(self) -> dict[str, Any]:
        """The `TrainingArguments` the recipe decides: accumulation and clipping."""
        window = self.recipe.spec.window
        return {
            "gradient_accumulation_steps": window.microbatches,
            "max_grad_norm": window.clip_norm or 0.0,  # 0: the Trainer does not clip
        }

    def optimizers(self, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, RecipeLRScheduler]:
        """The Trainer's `optimizers=`: the recipe's optimizer over the trainable parameters
        and its LR scheduler on this callback's token clock."""
        optimizer = self.recipe.optimizer(p for p in model.parameters() if p.requires_grad)
        return optimizer, self.recipe.lr_scheduler(optimizer, self.tokens_per_step)

    @contextlib.contextmanager
    def evaluation_weights(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> Iterator[None]:
        """The model holds the recipe's evaluation weights inside the block (to save or export
        them after training: `with callback.evaluation_weights(model, optimizer): ...`)."""
        if self.ema is None:
            raise RuntimeError("RecipeCallback: no EMA bank before the Trainer starts training")
        with self.recipe.evaluation_weights(optimizer, self.ema):
            yield

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        self.ema = bank = self.recipe.ema(kwargs["model"])
        if state.global_step > 0:  # the Trainer resumed from checkpoint-<global_step>
            path = _checkpoint(args, state) / EMA_FILE
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path}: the Trainer resumed at step {state.global_step} but its "
                    "checkpoint holds no EMA bank (was it saved with RecipeCallback?)"
                )
            bank.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        if args.eval_on_start:
            self._enter_evaluation(kwargs)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        tokens = state.global_step * self.tokens_per_step
        self.ema.update(self.recipe.clock(tokens))  # type: ignore[union-attr]
        if control.should_evaluate:
            self._enter_evaluation(kwargs)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        if control.should_evaluate:  # an epoch-end evaluation
            self._enter_evaluation(kwargs)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        self._leave_evaluation()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        self._leave_evaluation()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        if state.is_world_process_zero:
            buffer = io.BytesIO()
            torch.save(self.ema.state_dict(), buffer)  # type: ignore[union-attr]
            atomic_write_bytes(_checkpoint(args, state) / EMA_FILE, buffer.getvalue())

    def _enter_evaluation(self, kwargs: dict[str, Any]) -> None:
        if self._evaluation is None:  # once per evaluation, however many hooks ask
            self._evaluation = contextlib.ExitStack()
            self._evaluation.enter_context(
                self.evaluation_weights(kwargs["model"], kwargs["optimizer"])
            )

    def _leave_evaluation(self) -> None:
        """The training point back (a no-op where the Trainer evaluated unasked, e.g. a user's
        `trainer.evaluate()`: that one sees the raw weights)."""
        if self._evaluation is not None:
            self._evaluation.close()
            self._evaluation = None


def _checkpoint(args: TrainingArguments, state: TrainerState) -> Path:
    """The folder the Trainer saves step `global_step` into (and resumes it from)."""
    return Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
