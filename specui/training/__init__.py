"""Training drafters by self-distillation: one loop (``loop.py``) for every algorithm,
each bringing its objective (``specui/algorithms/<algo>/objective.py``).

    from specui.training.config import TrainConfig
    from specui.training.loop import train
    train(TrainConfig(algorithm="dflash", verifier="embedded", prompts="gsm-symbolic",
    out="runs/dflash"))

An algorithm's ``AlgorithmSpec`` names its ``Objective`` subclass (``build`` a fresh
drafter, ``loss`` of a batch through the model's own training-layout forward);
``objectives.py`` holds what they share.  The package itself imports nothing:
``specui.jobs.training`` is imported by light processes (job listings) that must not pay
for torch.
"""
