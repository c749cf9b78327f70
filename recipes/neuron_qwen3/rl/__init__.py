"""Online RL (METHOD=grpo): `rewards.py` (the reward functions, built in and the user's, and their checks),
`grpo.py` (group advantages and the clipped policy loss, as TRL computes them), `rollout.py` (each step's prompts
answered by the generator, scored, and laid out as training rows)."""
