"""`nightshift chat`, the Textual TUI: chat, tool cards, live GPUs and jobs, a k9s-style job
view, approvals as modals, the audit. Imported only when the command starts it."""

from nightshift.agent.doors.tui.app import ChatApp

__all__ = ["ChatApp"]
