"""What a schedule would cost: the device cost model and the stream simulator."""
