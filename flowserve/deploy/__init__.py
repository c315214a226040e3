"""``flowserve deploy render``: container images, a Compose file and Kubernetes objects from a topology."""

from flowserve.deploy.render import NodePlan, Plan, render, write

__all__ = ["NodePlan", "Plan", "render", "write"]
