"""`schedule_search.integrations.hf` with the real `transformers.Trainer` on a tiny Llama
built from scratch on the CPU: the LR it logs is the recipe's, its EMA is an independent
`torch.optim.swa_utils.AveragedModel` with the recipe's tau, evaluation sees the EMA and gives
the raw weights back bit for bit (AdamW and schedule-free), and a resume continues the bank."""

from pathlib import Path

import pytest
import torch
import yaml
from torch.optim.swa_utils import AveragedModel
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from schedule_search.integrations.hf import EMA_FILE, RecipeCallback
from schedule_search.recipe import load_recipe

RECIPE = Path(__file__).parents[2] / "data" / "recipe_format1.yaml"  # warmup, then 1/t^0.5
SEQ, BATCH, ACCUMULATION = 16, 4, 2
TOKENS_PER_STEP = SEQ * BATCH * ACCUMULATION
FRACTION = 0.3  # an EMA that lags well behind the raw weights over 24 steps
STEPS = 24


def write_recipe(folder: Path, optimizer: str = "adamw", policy: str = "microbatches") -> Path:
    """The shipped recipe with a 2-micro-batch window and a slow EMA, rescaled (`n_params`)
    so that 24 steps of 128 tokens cover its warmup and its decay (Chinchilla = 2,000 tokens)."""
    spec = yaml.safe_load(RECIPE.read_text())
    spec["optimizer"]["name"] = optimizer
    spec["ema"] = {"fractions": [0.0, FRACTION], "objective": FRACTION}
    spec["window"].update(policy=policy, microbatches=ACCUMULATION)
    spec["n_params"] = 100
    path = folder / f"{optimizer}-{policy}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


def token_rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Sequences with structure to learn: each token is the previous one plus 1 (mod 64)."""
    start = torch.randint(0, 64, (n, 1), generator=torch.Generator().manual_seed(seed))
    ids = (start + torch.arange(SEQ)) % 64
    return [{"input_ids": row, "labels": row} for row in ids]


class ReferenceEma(TrainerCallback):
    """torch's `AveragedModel` with tau = 0.5 ** ((t1 - t0) / (frac * t1)) (the README's EMA
    formula, written out here), updated after each optimizer step; and what the model held whenever
    the Trainer evaluated."""

    def __init__(self, model: torch.nn.Module, recipe) -> None:
        self.recipe = recipe
        self.clocks: list[float] = [0.0]

        def average(averaged, weights, n_averaged):
            t0, t1 = self.clocks[-2], self.clocks[-1]
            tau = 0.5 ** ((t1 - t0) / (FRACTION * t1))
            return tau * averaged + (1 - tau) * weights

        self.averaged = AveragedModel(model, avg_fn=average, use_buffers=True)
        self.averaged.update_parameters(model)  # the first call copies: the initial weights
        self.evaluated_with: list[list[torch.Tensor]] = []

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.clocks.append(self.recipe.clock((state.global_step + 1) * TOKENS_PER_STEP))
        self.averaged.update_parameters(model)

    def on_prediction_step(self, args, state, control, model=None, **kwargs):
        tensors = [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]
        self.evaluated_with.append([t.detach().clone() for t in tensors])


def train(folder: Path, recipe_path: Path, eval_steps: int | None, resume: bool = False, **extra):
    recipe = load_recipe(recipe_path)
    model = tiny_llama()
    callback = RecipeCallback(recipe, tokens_per_step=TOKENS_PER_STEP)
    reference = ReferenceEma(model, recipe)
    args = TrainingArguments(
        output_dir=str(folder),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=8,
        logging_steps=1,
        eval_strategy="steps" if eval_steps else "no",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=STEPS // 2,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        **callback.training_arguments(),
        **extra,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=token_rows(64, seed=1),
        eval_dataset=token_rows(8, seed=2),
        callbacks=[callback, reference],
        optimizers=callback.optimizers(model),
    )
    trainer.train(
        resume_from_checkpoint=str(folder / f"checkpoint-{STEPS // 2}") if resume else None
    )
    return recipe, model, callback, reference, trainer


def test_the_trainer_gets_the_recipes_lr_ema_and_evaluation_weights(tmp_path):
    recipe, model, callback, reference, trainer = train(tmp_path, write_recipe(tmp_path), 6)
    assert trainer.args.gradient_accumulation_steps == ACCUMULATION

    logged = [(e["step"], e["learning_rate"]) for e in trainer.state.log_history if "loss" in e]
    assert [step for step, _ in logged] == list(range(1, STEPS + 1))
    for step, lr in logged:  # the LR of optimizer step `step`, after (step - 1) steps' tokens
        clock = recipe.clock((step - 1) * TOKENS_PER_STEP)
        assert lr == pytest.approx(recipe.peak_lr * recipe.lr_multiplier(clock), rel=1e-12)
    multipliers = [lr / recipe.peak_lr for _, lr in logged]
    assert (
        multipliers[0] < 0.5 and max(multipliers) > 0.8 and multipliers[-1] < 0.5
    )  # warmup, decay

    ours = callback.ema.weights(FRACTION)
    module = reference.averaged.module  # parameters, then float buffers (rotary frequencies)
    theirs = [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]
    raw = list(model.parameters())
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-6)
    assert max((a - w).abs().max() for a, w in zip(ours, raw, strict=False)) > 1e-3  # it lags

    # 4 evaluations (steps 6, 12, 18, 24), each of one batch, saw the EMA of their step.
    assert len(reference.evaluated_with) == STEPS // 6
    last = reference.evaluated_with[-1]
    for seen, averaged in zip(last, ours, strict=True):
        torch.testing.assert_close(seen, averaged, rtol=0, atol=1e-6)
    assert (tmp_path / f"checkpoint-{STEPS}" / EMA_FILE).is_file()


@pytest.mark.parametrize("optimizer", ["adamw", "schedulefree_adamw"])
def test_evaluating_gives_the_training_point_back_bit_for_bit(tmp_path, optimizer):
    path = write_recipe(tmp_path, optimizer)
    evaluated = train(tmp_path / "evaluated", path, eval_steps=5)[1]
    plain = train(tmp_path / "plain", path, eval_steps=None)[1]
    for a, b in zip(evaluated.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_resumed_trainer_continues_the_bank(tmp_path):
    """One run of 24 steps saves at 12; a new Trainer resumes there and ends where it ended."""
    path = write_recipe(tmp_path)
    whole = train(tmp_path, path, eval_steps=None)[2].ema
    resumed = train(tmp_path, path, eval_steps=None, resume=True)[2].ema
    assert resumed is not whole and resumed.t == whole.t
    for a, b in zip(resumed.weights(FRACTION), whole.weights(FRACTION), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    (tmp_path / f"checkpoint-{STEPS // 2}" / EMA_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"resumed at step {STEPS // 2}"):
        train(tmp_path, path, eval_steps=None, resume=True)


def test_a_window_the_trainer_cannot_accumulate_is_refused_in_one_line(tmp_path):
    for policy in ("tokens", "seconds", "grad_norm"):
        recipe = load_recipe(write_recipe(tmp_path, policy=policy))
        with pytest.raises(ValueError, match=f"window.policy: .*'{policy}'") as error:
            RecipeCallback(recipe, tokens_per_step=TOKENS_PER_STEP)
        assert "\n" not in str(error.value)
