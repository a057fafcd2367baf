"""What reaches the page live: the in-process fan-out behind SSE, the stream slots,
Supabase Realtime beside it (publisher and `crashdrill doctor supabase`), and the
machine telemetry feed.
"""
