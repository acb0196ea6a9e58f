"""One agent turn, whatever API it came in on: its session and prompt, admit -> pick -> bind -> stream -> complete, the
SSE relay."""
