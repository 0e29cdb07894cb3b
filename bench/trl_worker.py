"""TRL's GRPOTrainer on the problems and model `bench/trl_compare.py` hands it; prints one JSON line
with the wall time of every training step (generation + update). Runs in TRL's own venv
(.venv-trl): it imports nothing of the harness.

Usage (by trl_compare.py): .venv-trl/bin/python bench/trl_worker.py <spec.json>
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(spec_path: str) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    spec = json.loads(open(spec_path).read())
    problems = spec["problems"]
    rows = [{"prompt": [{"role": "user", "content": p["prompt"]}], "answer": p["answer"]} for p in problems]
    answers = {p["prompt"]: p["answer"] for p in problems}

    def correct(prompts, completions, **_):
        """1 when the completion's last integer is the answer (the arithmetic task's grader)."""
        out = []
        for prompt, completion in zip(prompts, completions):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            numbers = re.findall(r"-?\d+", text)
            out.append(float(bool(numbers) and numbers[-1] == str(answers[prompt[-1]["content"]])))
        return out

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.started = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.started)

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    rows_per_step = spec["problems_per_step"] * spec["group_size"]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), max_steps=spec["steps"], learning_rate=spec["lr"],
        per_device_train_batch_size=rows_per_step, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=spec["group_size"], max_completion_length=spec["max_new_tokens"], temperature=1.0,
        beta=0.0, num_iterations=1, gradient_checkpointing=False, use_cpu=True, bf16=False, fp16=False,
        report_to=[], logging_steps=10_000, save_strategy="no", seed=spec["seed"], disable_dropout=True,
        dataloader_num_workers=0, max_grad_norm=1.0, shuffle_dataset=True, log_completions=False,
    )
    lora = LoraConfig(r=spec["lora_rank"], lora_alpha=spec["lora_alpha"], target_modules=spec["lora_targets"],
                      lora_dropout=0.0, task_type="CAUSAL_LM")
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=correct, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, peft_config=lora, callbacks=[timer])
    started = time.perf_counter()
    trainer.train()
    print(json.dumps({"step_s": timer.times, "wall_s": time.perf_counter() - started}))


if __name__ == "__main__":
    main(sys.argv[1])
