def load_batch():
    raise ValueError("no batch here: the failing job of the tests")


load_batch()
