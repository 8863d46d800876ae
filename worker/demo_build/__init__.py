"""The demo model's build and training: model.py builds a tiny random llama offline (the tests' model) and holds the
parts every demo model shares (tokenizer, config, saving); corpus.py is the English prose it learns; train.py trains
the shipped demo model (`onelane make-demo-model worker/demo --train`). That trained model is a model folder, not code,
and stays in worker/demo/.
"""
