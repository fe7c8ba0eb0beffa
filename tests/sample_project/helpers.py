"""What the sample project's tests share (plain code: the fixtures come from busd's plugin)."""


def receive_all(receiver, expected: int) -> list:
    """`expected` messages from an SDK receiver, asking again while they are on their way."""
    got: list = []
    for _ in range(10):
        if len(got) >= expected:
            break
        got += receiver.receive_messages(max_message_count=expected - len(got), max_wait_time=2)
    return got
