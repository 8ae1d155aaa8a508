"""Verified rendering of calls into token sequences ``S_t`` with role labels and targets."""

from memorywalker.render.render import Renderer, RenderOptions
from memorywalker.render.types import (
    ROLE_ID,
    ROLES,
    RenderedCall,
    RenderedTrajectory,
    RenderError,
    message_to_hf,
    tools_to_hf,
)

__all__ = [
    "ROLES",
    "ROLE_ID",
    "RenderError",
    "RenderOptions",
    "RenderedCall",
    "RenderedTrajectory",
    "Renderer",
    "message_to_hf",
    "tools_to_hf",
]
