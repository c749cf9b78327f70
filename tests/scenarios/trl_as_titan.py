"""torchtitan's optimizer settings in the runs under test, as TRL's trainer arguments: AdamW with betas 0.9/0.95,
eps 1e-8, no weight decay, gradients clipped at 1.0, a constant learning rate; on the CPU in float32, seeded,
nothing saved or reported. The TRL scenarios (trl_dpo.py, trl_grpo.py) import it from beside them."""

OPTIMIZER = dict(
    lr_scheduler_type="constant",
    weight_decay=0.0,
    adam_beta1=0.9,
    adam_beta2=0.95,
    adam_epsilon=1e-8,
    max_grad_norm=1.0,
    use_cpu=True,
    bf16=False,
    fp16=False,
    seed=0,
    save_strategy="no",
    report_to="none",
)
