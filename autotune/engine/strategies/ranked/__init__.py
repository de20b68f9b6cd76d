"""`--strategy ranked`: the registered strategy (`strategy`), its plans and model loading (`plans`),
its batches and adaptive stop (`batches`), the ranking model (`model`), the model's training rows
(`rows`), and the models shipped with the package (`rank_models/`, tools/fit_rank_models.py writes them).

Nothing here is imported on import of the package: options read `batches.Ranked` without loading the model.
"""
