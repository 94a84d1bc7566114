"""Where people are: approval prompts and notifications on Slack and WeChat Work.

A channel posts an approval request as a card with Approve / Reject, updates it as votes arrive,
and posts notifications; a person's click comes back to the daemon's callback endpoint, is
verified (signature, timestamp, replay), mapped to a policy principal and counted by the same
`Approvals.vote` as a vote from the CLI or the TUI.
"""
