"""A vertical student as an MLflow pyfunc model, logged "from code": MLflow stores this
file with the model and runs it on ``mlflow.pyfunc.load_model`` (nothing is unpickled).
The weights come from the model's ``model`` artifact through students.store: files
checked against digests.json, tensors read weights-only. See students/pyfunc.py for the
input and output."""

import mlflow
from mlflow.pyfunc import PythonModel


class Student(PythonModel):
    def load_context(self, context):
        from students.store import load_student

        self.model = load_student(context.artifacts["model"])
        self.config = dict(context.model_config or {})

    def predict(self, context, model_input, params=None):
        from students.pyfunc import score_frame

        return score_frame(self.model, self.config, model_input, params)


mlflow.models.set_model(Student())
