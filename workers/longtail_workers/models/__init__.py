"""Policy models: loading any Hugging Face directory, and the built-in ``builtin:tiny`` / ``small``.

- :mod:`~longtail_workers.models.loading`: ``load_policy(path, dtype, device)``, the one loading
  path for ``builtin:<name>`` and user directories;
- :mod:`~longtail_workers.models.recipe`: the built-in policies' recipes, sizes, build estimates;
- :mod:`~longtail_workers.models.builtin`: their build and cache;
- :mod:`~longtail_workers.models.tokenizer`: its byte-level tokenizer;
- :mod:`~longtail_workers.models.sft`: the supervised warm-start;
- :mod:`~longtail_workers.models.evaluation`: greedy accuracy on task items.

Submodules are imported explicitly by their users; importing this package loads nothing heavy.
"""
