"""Models as the method sees them: loading from the hub or a directory, the float32 output head,
the embedding scale sigma comes from, a trained checkpoint's state, and the toy's builders."""
