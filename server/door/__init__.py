"""The front door: connections and requests before any route (caps, timeouts, allowed
hosts, forwarded headers, the browser guard), who is asking (student and instructor
sessions) and what each may hold (quotas).
"""
