"""The doors: every way a person or a program reaches the brain — the CLI and its commands, the
terminal UI, chat, Slack and WeChat Work channels, the library API and the daemon's socket (server
and client). A door may import the brain; the brain never imports a door."""
