"""tools build: the runtime -> one portable executable per architecture, built in containers."""
