"""The section itself (d2l 13.6), and nothing else: what the book prints, its four pieces first:

- the step: split the batch, forward and backward on every device, ``trainer.step``:
  ``steps.train_batch`` (with ``train_epoch``, ``evaluate_accuracy_gpus``);
- the split, a batch cut into one shard per device: ``devices.split_batch``;
- the Trainer, and the kvstore that sums the gradients: ``kvstores.make_trainer``;
- the text's loop, as printed: ``book.train_book``.

Around them: ``model`` and ``recipes`` (the networks and their settings), ``data``,
``results`` (an epoch's figures), ``utils`` (the book's ``Timer``, ``Accumulator``).
The loop made resumable and open to hooks (``train``) is the machinery's
(``machinery.training``); what watches and stops a run is ``observe``'s.
"""
