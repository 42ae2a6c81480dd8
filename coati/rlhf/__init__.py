"""The supervised RLHF stages (SFT, reward model) on the trainer plugins; PPO with a critic comes next."""
