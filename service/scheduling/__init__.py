"""Scheduling: the continuous batcher that feeds one engine from many requests (queueing,
admission, encoder overlap, delivery) and the turns several engines take on one device."""
