"""Longtail's operator: reconciles RLJob resources into pods, services and status.

Runs under kopf in its own slim image; never imports torch, transformers or vllm (an
import-linter contract enforces it). Pure manifest builders and decision functions come from
``longtail_api``; this package adds the Kubernetes wiring.
"""
