"""Generators for the Helm chart's derived files, and the metric references the tests check.

Run at dev time only: ``python -m longtail_chart.chartgen --write`` (``make chart``) and
``--check`` (``make verify``). ``tests/unit/helm`` and ``tests/integration/test_helm_*.py``
import :mod:`longtail_chart.metricrefs` and :mod:`longtail_chart.dashpanels`. It sits on the
operator side of the import walls: it may import ``longtail_api``, never the workers or torch.
"""
