"""Moved to tasks/chat_prompt.py (the web renders and counts prompts as the worker does); kept for the modules that
still import it from here."""

from tasks.chat_prompt import FALLBACK_PROMPT, chat_input, knows_tools, renders_names

__all__ = ["FALLBACK_PROMPT", "chat_input", "knows_tools", "renders_names"]
